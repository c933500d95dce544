"""A warm fleet: vLLM replicas of one base model started once and kept between runs, so a rerun,
an ablation child or an evaluation attaches to servers that already serve instead of paying vLLM's
start. `rlfleet fleet up` holds them (serve.py) and writes where they are (state.py); a run with
`fleet = "NAME"` attaches (attach.py): one run at a time, its own start weights loaded first."""
