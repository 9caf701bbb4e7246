"""methods/backbones"""
