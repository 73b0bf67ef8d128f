"""guard/launch"""
