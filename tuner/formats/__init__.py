"""The files gemm-tuner writes and reads, each schema in one module, so that the writers and
the readers cannot drift:

- `table`: our exact table (`tune export table`, `tune suggest`, the runtime's online
  cache), which tuner.runtime reads;
- `flaggems`: FlagGems' expand YAML and tune_configs.yaml, the expand file being what
  tuner.runtime.expand answers keys from;
- `device`: the device header each file carries, as a mapping or as comment lines;
- `files`: YAML as every format dumps it, written atomically.

What goes in the files is decided elsewhere (tuner.export, tuner.suggest). Nothing here
imports torch, Triton, Optuna or the database (tests/test_architecture.py), so the deployment
side may read every format.
"""
