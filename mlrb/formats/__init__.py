"""A run in the field's shared formats, written from its run folder: `atif`, Harbor's trajectory format."""
