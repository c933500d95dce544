"""rlfleet.config"""
