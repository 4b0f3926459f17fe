"""`python -m mlrb.tracking serve`: a lab's MLflow tracking server, on PostgreSQL
(mlrb/store/tracking_server.py). The store's own code is in mlrb/store/."""

if __name__ == "__main__":
    from mlrb.store.tracking_server import main

    main()
