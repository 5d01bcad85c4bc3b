"""Code versions of the stages whose own code also hashes them (download's fetched
files, prepare's units): here, outside those packages, so that declaring the
stages (``flows/registry.py``) imports neither package's code.  Bump one when a
change alters that stage's output: old outputs stop being cache hits."""

DOWNLOAD = "1"
PREPARE = "1"
