"""What the user gives: the model, the hardware, the job and a plan."""

from autotune.specs.hardware import Efficiency, HardwareSpec, hardware_from_dict
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec, model_from_dict, model_from_hf_config
from autotune.specs.plan import Plan, check_plan, even_split, plan_from_dict

__all__ = ["Efficiency", "HardwareSpec", "JobSpec", "ModelSpec", "Plan", "check_plan", "even_split",
           "hardware_from_dict", "model_from_dict", "model_from_hf_config", "plan_from_dict"]
