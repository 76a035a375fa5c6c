"""One run's training, alone or in a fused group (imports core, model, data, fused):
- config (TrainConfig, run ids), checks, record, provenance, metrics, run_data: what a run is and what it reports;
- loop: train_and_evaluate, a run alone's setup and step; group_loop: train_group, a fused group's;
- epochs: the one epoch loop both drive; run_book: each run's books in it; finite_guard: the step's divergence check;
- state, state_saves, phase_times, event_log, epoch_log, evaluate: resume states, when they are saved, timings,
  curves, progress lines, evaluation;
- ablation; cli: `python -m adaptune train`."""
