"""Memory model, fake-device estimation and fit prediction; public API in :mod:`heptstudy.fit`."""
