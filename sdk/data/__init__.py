"""Reference and synthetic data sources (offline; nothing is downloaded at run time)."""
