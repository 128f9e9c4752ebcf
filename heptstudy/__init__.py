"""heptstudy."""
