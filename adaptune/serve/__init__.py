"""One model, many tasks: bundles of a backbone and each task's best run, and predictions from them."""
