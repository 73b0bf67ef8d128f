"""guard/judge"""
