"""Where tensor tasks run: in-process threads (cpu/gpu), emulated Lambdas (local), AWS Lambda (aws)."""

from dorylus_py.platforms.base import Completion, LambdaContext, Platform
from dorylus_py.platforms.inproc import InprocPlatform
from dorylus_py.platforms.local import LocalLambdaPlatform

__all__ = ["Completion", "InprocPlatform", "LambdaContext", "LocalLambdaPlatform", "Platform"]
