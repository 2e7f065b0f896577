"""Speed benchmarks of the deployed path (not in the wheel); see README.md."""
