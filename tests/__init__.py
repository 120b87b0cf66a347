"""monsoon's own tests."""
