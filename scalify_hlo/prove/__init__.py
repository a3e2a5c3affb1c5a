"""prove"""
