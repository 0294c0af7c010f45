module hv.local/sonobuoybuild

go 1.26.4

require github.com/vmware-tanzu/sonobuoy v0.57.5
