"""rlfleet.flows"""
