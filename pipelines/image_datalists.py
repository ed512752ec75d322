"""Turn a public imaging dataset, or a hospital's DICOM export, into MONAI datalists.

One JSON datalist per site (<out>/<site>.json), split by the dataset's own site or
hospital field where it has one; point a site file's ``datalist`` at it:

    python pipelines/image_datalists.py chexpert ~/data/CheXpert-v1.0-small --out dl \
        --finding "Pleural Effusion" --uncertain ones
    python pipelines/image_datalists.py chestxray14 ~/data/ChestX-ray14 --out dl
    python pipelines/image_datalists.py mimic-cxr ~/data/mimic-cxr-jpg/2.0.0 --out dl
    python pipelines/image_datalists.py fed-ixi ~/data/fed_ixi --out dl
    python pipelines/image_datalists.py pacs /mnt/export/DICOMDIR --out dl --modality MR
"""

from fedbn_med.cli.datalists import main

if __name__ == "__main__":
    main()
