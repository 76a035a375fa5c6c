"""Stand-ins the bench drivers and the tests share (tests may import bench; bench never imports tests): a GCS
bucket on the loopback (gcs_emulator), a trainer that trains nothing, named through $ADAPTUNE_TRAINER
(stub_trainer), and a loopback server's small HTTP helpers (loopback)."""
