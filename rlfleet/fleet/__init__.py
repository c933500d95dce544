"""A warm fleet: vLLM replicas of one base model started once and kept between runs, a warm trainer
beside each (warm.py) and a Prefect API (api.py), so a rerun, an ablation child or an evaluation
attaches instead of paying the start. `rlfleet fleet up` holds them (serve.py) and writes where they
are (state.py); a run with `fleet = "NAME"` attaches (attach.py): one run per replica, its own
start weights loaded first."""
