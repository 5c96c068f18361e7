# Copyright IBM Corp. 2018, 2026
# SPDX-License-Identifier: MPL-2.0

path "secret/data/kv1" {
  capabilities = ["read"]
}