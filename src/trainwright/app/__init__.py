"""Command line applications: `trainwright demo / train / plot`."""
