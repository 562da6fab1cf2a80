"""pbr_core: Personalize Before Retrieve, framework-free."""
