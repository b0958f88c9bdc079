"""The Hub: pushes (`push_to_hub`, checkpoint pushes per `hub_strategy`) and the model card."""
