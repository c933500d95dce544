"""A run's lifecycle in its store, by concern: the resolved configs and preflight (`configs`), one
controller per run (`lock`), the processes that controller runs (`handles`), process logs (`logs`),
what `rlfleet runs status` reports (`status`), the recoveries it records (`recoveries`), and the
stall watchdog: who waits for whom (`waits`, from what moved last: rlfleet/progress.py, which the
engines update), the processes' stacks (`dumps`) and the watchdog itself (`stalls`). The resume point is the trainer's (trainer/resume.py): an SFT trainer resumes by itself."""
