"""Joining and simulating federations: the hospital client, configs, the in-process runner, the demo."""
