"""The run-time estimate below the apps: the fake-device step, checkpoint-plan calibration,
memory models and their keys."""
