"""The request contract shared by the gateway and the worker: error codes and their one
renderer (`errors`), request field names and strict typing (`fields`), the mask policy
(`policy`: each request read once into a `mask_view`, then the ordered `rules`; its one
settings model in `policy_settings`) and the settings loader (`settings`). Imports no torch,
no gateway, no worker.
"""
