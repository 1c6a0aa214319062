"""The request contract shared by the gateway and the worker: error codes and their one
renderer (`errors`), request field names and strict typing (`fields`), the mask-policy checks
(`policy`) and the settings loader (`settings`). Imports no torch, no gateway, no worker.
"""
