"""Runs in other tools' formats, from their run folders: `python -m mlrb.export FORMAT ...`
(mlrb/export/__main__.py lists the formats; each is a module whose `main(argv)` returns the
exit status)."""
