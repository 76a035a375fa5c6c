"""Many runs, one store: experiment specs, the plan and its cost, the run store and leases, the shard
runner, staging, the fan-in and status (imports every layer below, report included)."""
