"""adaptune: Houlsby et al. 2019 adapter tuning for BERT-family encoders, reproducible at scale.

The library never imports kfp: a run works from a shell, inside a KFP component, or anywhere torch
and transformers are installed.
"""

__version__ = "0.2.0"
