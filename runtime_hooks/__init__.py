"""The edge: installs recallbound into agent loops."""
