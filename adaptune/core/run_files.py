"""The files of one run's directory, named once (the run store keeps each run's under runs/<run_id>/).

Plain names, no imports: the training loop, the run store, the status and the bundle all read them."""

RECORD_FILE = "record.json"  # the finished (or failed) run record: written last
CHECKPOINT_DIR = "checkpoint"  # the compact task checkpoint (what the method trained)
STATE_FILE = "train_state.pt"  # the resumable training state, until the run finishes
ATTEMPTS_FILE = "attempts.json"  # transient failures seen so far (preemption, OOM, network)
TRACEBACK_FILE = "traceback.txt"  # the full story behind a failed run's one-line reason
# A SQuAD run's {question id: answer text} of the final epoch's validation questions: the prediction
# file the official evaluate-v1.1.py reads.
PREDICTIONS_FILE = "predictions.json"
