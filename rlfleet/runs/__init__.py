"""A run's lifecycle in its store, by concern: the resolved configs and preflight (`configs`), one
controller per run (`lock`), the processes that controller runs (`handles`), process logs (`logs`),
what `rlfleet runs status` reports (`status`), the recoveries it records (`recoveries`), and the
stall watchdog: what moved last (`progress`), who waits for whom (`waits`), the processes' stacks
(`dumps`) and the watchdog itself (`stalls`). The
resume point is the trainer's (trainer/resume.py): an SFT trainer resumes by itself."""
