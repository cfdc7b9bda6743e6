"""Where prompts and answers come from, and how responses are scored: sources, tasks, rewards."""
