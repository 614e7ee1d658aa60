"""The optimizer study: an lr sweep per optimizer, its records and its tables."""
