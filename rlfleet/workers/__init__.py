"""rlfleet.workers"""
