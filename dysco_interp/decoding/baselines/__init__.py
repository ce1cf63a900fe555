"""The field's attention-steering methods and DySCO's open variants as plan programs, each in a file of its own;
importing a module registers its methods."""
