"""The side-by-side benchmark (not part of the test suite): `python -m bench --quick`."""
