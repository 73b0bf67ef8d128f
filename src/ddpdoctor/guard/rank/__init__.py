"""guard/rank"""
