{{/* Names, labels, and proxy.yaml as the chart writes it from the values. */}}

{{- define "ktp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects' name: the release name alone when it already says the chart's (the usual install,
     `helm install kafka-throttle-proxy ...`), so the Service, and the advertised host, are kafka-throttle-proxy. */}}
{{- define "ktp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ktp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ktp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ktp.labels" -}}
{{ include "ktp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "ktp.advertisedHost" -}}
{{- .Values.listen.advertisedHost | default (printf "%s.%s.svc.%s" (include "ktp.fullname" .) .Release.Namespace .Values.clusterDomain) -}}
{{- end -}}

{{/* quotas.scope: the one given, else fleet for several replicas and cluster for one (a quota then means one
     bucket per entity across the cluster however many replicas run). */}}
{{- define "ktp.quotaScope" -}}
{{- $default := ternary "fleet" "cluster" (gt (int .Values.replicaCount) 1) -}}
{{- .Values.quotas.scope | default $default -}}
{{- end -}}

{{- define "ktp.fleet" -}}
{{- ternary "true" "" (eq (include "ktp.quotaScope" .) "fleet") -}}
{{- end -}}

{{/* The proxy's fleet.name allows [A-Za-z0-9._-]{1,100}; namespaces and release names are within that. */}}
{{- define "ktp.fleetName" -}}
{{- .Values.fleet.name | default (printf "%s.%s" .Release.Namespace (include "ktp.fullname" .) | trunc 100 | trimSuffix ".") -}}
{{- end -}}

{{- define "ktp.fleetSecretName" -}}
{{- .Values.fleet.existingSecret | default (printf "%s-fleet" (include "ktp.fullname" .)) -}}
{{- end -}}

{{- define "ktp.brokerPort" -}}
{{- $port := add (int .root.Values.listen.brokerPorts.first) (int .id) -}}
{{- if gt $port (int .root.Values.listen.brokerPorts.last) -}}
{{- fail (printf "brokers.nodeIds: node id %d needs port %d, past listen.brokerPorts.last %d" (int .id) $port (int .root.Values.listen.brokerPorts.last)) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/* Where the mounted files are; proxy.yaml names them. */}}
{{- define "ktp.configDir" -}}/etc/kafka-throttle-proxy{{- end -}}

{{/* proxy.yaml: `config` first, then what the values above it say, which wins on every key it sets. */}}
{{- define "ktp.proxyConfig" -}}
{{- $v := .Values -}}
{{- $dir := include "ktp.configDir" . -}}
{{- $upstream := dict "bootstrap_servers" $v.upstream.bootstrapServers -}}
{{- if $v.upstream.tls.enabled -}}
{{- $tls := dict "check_hostname" $v.upstream.tls.checkHostname -}}
{{- if ne (empty $v.upstream.tls.certKey) (empty $v.upstream.tls.keyKey) -}}
{{- fail "upstream.tls.certKey and upstream.tls.keyKey go together" -}}
{{- end -}}
{{- if and (or $v.upstream.tls.caKey $v.upstream.tls.certKey) (not $v.upstream.tls.existingSecret) -}}
{{- fail "upstream.tls.existingSecret: the Secret holding upstream.tls.caKey (or certKey and keyKey) is required" -}}
{{- end -}}
{{- if $v.upstream.tls.caKey -}}{{- $_ := set $tls "ca_file" (printf "%s/upstream-tls/%s" $dir $v.upstream.tls.caKey) -}}{{- end -}}
{{- if $v.upstream.tls.certKey -}}
{{- $_ := set $tls "cert_file" (printf "%s/upstream-tls/%s" $dir $v.upstream.tls.certKey) -}}
{{- $_ := set $tls "key_file" (printf "%s/upstream-tls/%s" $dir $v.upstream.tls.keyKey) -}}
{{- end -}}
{{- $_ := set $upstream "tls" $tls -}}
{{- end -}}
{{- $listen := dict "host" "0.0.0.0" "advertised_host" (include "ktp.advertisedHost" .) "bootstrap_port" (int $v.listen.bootstrapPort) "broker_ports" (printf "%d-%d" (int $v.listen.brokerPorts.first) (int $v.listen.brokerPorts.last)) -}}
{{- if $v.listen.tls.enabled -}}
{{- if not $v.listen.tls.existingSecret -}}
{{- fail "listen.tls.existingSecret: the kubernetes.io/tls Secret with the proxy's certificate is required" -}}
{{- end -}}
{{- $tls := dict "cert_file" (printf "%s/listen-tls/tls.crt" $dir) "key_file" (printf "%s/listen-tls/tls.key" $dir) "client_auth" $v.listen.tls.clientAuth "principal_mapping_rules" $v.listen.tls.principalMappingRules -}}
{{- if ne $v.listen.tls.clientAuth "none" -}}{{- $_ := set $tls "ca_file" (printf "%s/listen-tls/ca.crt" $dir) -}}{{- end -}}
{{- $_ := set $listen "tls" $tls -}}
{{- end -}}
{{- $quotas := deepCopy $v.quotas -}}
{{- $_ := set $quotas "scope" (include "ktp.quotaScope" .) -}}
{{- $config := dict "upstream" $upstream "listen" $listen "shutdown_unready_ms" (int $v.drain.shutdownUnreadyMs) "shutdown_grace_ms" (int $v.drain.shutdownGraceMs) "quotas" $quotas "metrics" (dict "port" (int $v.metrics.port) "host" "0.0.0.0") -}}
{{- if include "ktp.fleet" . -}}
{{- $_ := set $config "fleet" (dict "name" (include "ktp.fleetName" .) "secret_file" (printf "%s/fleet/secret" $dir)) -}}
{{- end -}}
{{- toYaml (mergeOverwrite (deepCopy $v.config) $config) -}}
{{- end -}}
