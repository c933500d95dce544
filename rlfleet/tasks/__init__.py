"""rlfleet.tasks"""
