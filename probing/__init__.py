"""probing"""
