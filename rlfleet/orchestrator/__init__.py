"""rlfleet.orchestrator"""
