"""The paper's hyperparameter grids, named once: the experiments sweep them, the claims say how much of
them each claim was decided on. (Table 4's epochs per additional task are in data.tasks, `paper_epochs`.)"""

from __future__ import annotations

GLUE_LRS = (3e-5, 3e-4, 3e-3)  # §3.2: "We sweep learning rates in {3e-5, 3e-4, 3e-3}" -- "for adapter tuning"
GLUE_EPOCHS = (3, 20)  # §3.2: "and number of epochs in {3, 20}"
# Table 1's full fine-tuning row is Devlin et al. (2018)'s BERT-large GLUE protocol, not the adapters' grid:
# "We use a batch size of 32 and fine-tune for 3 epochs ... we selected the best fine-tuning learning rate
# (among 5e-5, 4e-5, 3e-5, and 2e-5) on the Dev set" (Devlin et al., §4.1), with random restarts for BERT-large.
# At the adapters' 3e-4 and 3e-3, BERT-large full fine-tuning diverges: those runs would only burn hours.
DEVLIN_GLUE_LRS = (2e-5, 3e-5, 4e-5, 5e-5)
DEVLIN_GLUE_EPOCHS = (3,)
EXTRA_LRS = (1e-5, 3e-5, 1e-4, 3e-3)  # §3.3
