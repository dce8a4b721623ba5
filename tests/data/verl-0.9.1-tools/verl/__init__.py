# Copyright 2024 Bytedance Ltd. and/or its affiliates
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# STUB (rlgen's tests): verl 0.9.1's own verl/__init__.py imports verl.protocol (ray, tensordict,
# torch.distributed) and verl.utils.device; none of that is needed by verl.tools, and ray is not
# installed next to rlgen. Only the version is kept. See ../README.md.

__version__ = "0.9.1"
