"""rlfleet: RL post-training as Prefect flows over vLLM and a torch trainer."""
