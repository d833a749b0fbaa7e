module selfserve

go 1.19
