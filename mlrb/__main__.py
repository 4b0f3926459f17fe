from mlrb.cli import main

if __name__ == "__main__":
    main(end_at_once=True)
