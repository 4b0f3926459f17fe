"""A run in the field's shared formats, written from its run folder: `atif`, Harbor's trajectory
format. Imports mlrb.run_files' trajectory, mlrb.store's record and mlrb.core."""
