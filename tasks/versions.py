"""Every stage's code version, in one place: a stage's fingerprint hashes it (flows/registry.py),
and download and prepare also stamp each fetched file and unit with theirs.  Here, outside the stage
packages, so that declaring the stages imports none of their code.  Bump a stage's version when a
change alters its output: its old outputs (and those downstream) stop being cache hits.  A change
that alters no output (a refactor, a new knob at its default) keeps it."""

DOWNLOAD = "1"
PREPARE = "3"  # 3: a part also ends at 64 MiB of strings (2: rows with no visible character are blank lines)
DEDUP = "2"
VOCAB = "1"
SAMPLING = "2"
SHARDS = "1"
PRETRAIN = "3"
AUDIT = "6"  # 6: baseline_every auto, EMAs per measurement
EVALUATE = "1"
