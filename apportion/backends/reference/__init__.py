"""The reference backend: a plan's schedule (``schedule.lower``) run core slice by core slice in
numpy, loop nests tile by tile in simulated memory; every other backend is checked against it."""
