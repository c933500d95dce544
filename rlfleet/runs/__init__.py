"""A run's lifecycle in its store, by concern: the resolved configs and preflight (`configs`), the
resume point (`resume`), one controller per run (`lock`), the processes that controller runs
(`handles`), process logs (`logs`), and what `rlfleet runs status` reports (`status`)."""
