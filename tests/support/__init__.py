"""One home for the helpers many test rooms share (issue 19): paths, waiting, job cleanup,
tiny drafters. Import the module you need; nothing here imports torch except drafters.py."""
