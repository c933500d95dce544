"""rlfleet.trainer"""
