"""rlfleet.inference"""
